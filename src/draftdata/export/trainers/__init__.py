"""export/trainers"""
